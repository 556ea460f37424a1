"""Conversions between pystrom Tables and other libraries: Arrow in and out, the Arrow C (device)
interface, and NumPy/CuPy/list inputs. Internal: the public entry points are methods of Table."""
