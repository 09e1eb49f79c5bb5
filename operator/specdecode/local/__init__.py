"""`specdecode run --local`: the whole experiment on one machine."""
