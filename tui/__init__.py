"""anatomy-top's terminal side: the NVML/host data layer, the reports and the Textual monitor."""

# The single source of the version (pyproject reads it; --version and the report header print it).
__version__ = "0.1.0"
