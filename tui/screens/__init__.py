"""Screens pushed over the browse screen; each declares its own bindings."""
