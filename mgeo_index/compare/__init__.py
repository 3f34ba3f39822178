"""Two parsed addresses compared field by field: the address elements and their vocabulary (``elements``), the
place's name (``names``), numbers read as written and the conflicts between them (``conflicts``), and the pair
features and explanations the models and answers read (``features``). Below the models and the query chain: it
reads parsed text alone (:mod:`mgeo_index.text`)."""
