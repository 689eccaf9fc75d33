"""ScanWeaver: find affine recurrences in loop code and compile them to parallel scans."""

__version__ = "0.1.0"
