"""``python -m mgeo_index.cli``: the ``mgeo-index`` command."""
from mgeo_index.cli import app

app()
