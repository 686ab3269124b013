"""Reading and presenting results: tables now; comparison, statistics and plots with the A/B work."""
