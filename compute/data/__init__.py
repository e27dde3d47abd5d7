"""Load the examples to attribute: local .jsonl/.csv/.tsv/.parquet files or a Hugging Face hub split.

Every source is reduced to the same thing, a list of ``Record``s (text, optional pair, label index, id, and per
task the target and foil words, the regression value or the QA answer), so the rest of attr-compute never looks at
file formats. Problems with the data are raised as one-line ``AttrscopeError``s that name the file, the row and the
fix. The columns each task reads are documented in docs/tasks.md ("Data formats").

The modules: ``sources`` (local files) and ``hub`` read a source into raw rows; ``columns`` and ``cells`` find the
columns and read a cell; one module per task (``classification``, ``regression``, ``masked_token``, ``next_token``,
``qa``; ``words`` holds what the two word tasks share) finds its columns and makes its records; ``load`` runs them.
"""

from .load import TASKS, gives_evidence, load_dataset
from .records import Dataset, Record
from .sources import SUPPORTED, SUPPORTED_TEXT

__all__ = ["Dataset", "Record", "SUPPORTED", "SUPPORTED_TEXT", "TASKS", "gives_evidence", "load_dataset"]
