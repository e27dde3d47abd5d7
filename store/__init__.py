"""attrscope store: the HDF5 contract between compute and the TUI. Imports only numpy and h5py."""

from .errors import StoreError
from .reader import Example, HeadMask, Store, open_store
from .schema import ENCODING_VERSION
from .writer import ExampleData, HeadMaskData, MethodLayout, MetricData, StoreWriter, add_metrics

__all__ = ["open_store", "Store", "Example", "StoreError", "StoreWriter", "ExampleData", "MethodLayout",
           "HeadMask", "HeadMaskData", "MetricData", "add_metrics",
           "ENCODING_VERSION"]
