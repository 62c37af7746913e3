"""``pyrula cloud serve``: the collector that fleets, workers and runners report to."""
