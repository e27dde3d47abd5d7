"""attrscope compute: models, data, attribution methods and the batch loop that writes an attrscope store."""

__version__ = "0.1.0"
