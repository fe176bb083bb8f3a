"""Page views per page and window, and each window's busiest pages."""
