"""Measuring mgeo-index: quality (:mod:`~mgeo_index.measure.evaluate`: pair classification, retrieval, the
number test set — ``mgeo-index eval``), the metrics as plain functions (:mod:`~mgeo_index.measure.metrics`), the one
dev / calib / train split of the labelled pairs (:mod:`~mgeo_index.measure.splits`, shared with training) and speed
(:mod:`~mgeo_index.measure.bench`: ``mgeo-index bench``).
"""
