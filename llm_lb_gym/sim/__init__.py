"""The simulator (numpy only, no Gymnasium). Importing it registers the preset catalog."""

from .catalog import register_catalog

register_catalog()
