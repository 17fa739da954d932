"""What the ranks, the notebook and the backends all read: the standard library only, light to
import (every rank imports some of it at start-up), and nothing from the folders above it."""
