"""attrscope store: the HDF5 contract between compute and the TUI. Imports only numpy and h5py.

Modules: schema (the layout, the one place that knows it), records (what a writer is given), writer (create,
append, close), copying (resume, rewrite, merge), metrics (metrics added in place), reader (open_store, Store,
Example), verify (read a whole store once), digests (each example's CRC-32 per dataset), table (tabular views),
scale (view statistics), integrity (safe opening), attrs, h5 (low-level writing), lock (one writer per store).
"""

from .copying import merge, resume
from .errors import StoreError
from .metrics import add_metrics
from .reader import Example, HeadMask, Store, open_store
from .records import ExampleData, HeadMaskData, MethodLayout, MetricData
from .schema import ENCODING_VERSION
from .verify import verify
from .writer import StoreWriter

__all__ = ["open_store", "Store", "Example", "StoreError", "StoreWriter", "ExampleData", "MethodLayout",
           "HeadMask", "HeadMaskData", "MetricData", "add_metrics", "merge", "resume", "verify",
           "ENCODING_VERSION"]
