"""The report: what each section shows (sections), rendered from report_templates/ (render), and its figures
(plots)."""
