"""Output: report.md/json/html and the analysis/ files the dashboard and compare read."""
