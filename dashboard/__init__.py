"""diagtrain dashboard: the Dash app that reads analyzer output (not built yet)."""
