"""The human review loop: a queue ordered by uncertainty (:mod:`~mgeo_index.review.uncertainty`), the
browser page that takes decisions, and the labels' way back into answers and models."""
