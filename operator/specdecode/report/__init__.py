"""The report: HTML, plots and the terminal summary."""
