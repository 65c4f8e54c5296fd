"""Reports: Markdown, LaTeX and PNG figures read from run directories."""
