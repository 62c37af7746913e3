"""Example workflow apps: ``orders`` (the README's and ``make run``'s) and ``bench`` (what
``pyrula-fleet bench`` runs). Importing this package registers neither, so
``--app pyrula.examples.bench`` serves the bench workflow alone."""
