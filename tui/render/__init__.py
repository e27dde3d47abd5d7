"""Pure renderers: functions from loaded data and view settings to rich renderables (no Textual, no HDF5), one
module per picture: tokens (and the colour bar), the layer strip, the heatmap, aligned method rows, the head grid and
the metric table. Widgets and screens draw what these return; tests check them without an app."""
