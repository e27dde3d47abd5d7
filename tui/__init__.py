"""attr-tui: a terminal browser for attrscope stores. Imports only store, textual, rich, numpy, click and stdlib."""
