"""Load scenarios behind `make bench`."""
