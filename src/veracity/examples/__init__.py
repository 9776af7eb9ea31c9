"""Example applications (``make run`` serves :mod:`veracity.examples.shop`)."""
