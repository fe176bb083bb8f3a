"""The Zeitgeist demo (MillWheel section 2): anomaly detection on search-query traffic."""
