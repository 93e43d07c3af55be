"""The published report: which rows each figure uses, the figures, findings, tables, provenance, the HTML report and sweep comparisons."""
