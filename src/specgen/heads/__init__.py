"""Draft heads on the target itself: EAGLE-1/2, EAGLE-3 and Medusa-1. Their forward math
(modules.py), the reference checkpoint layouts read and written (layout.py), and fitting a
head to a target's own next-token distributions (train.py). The drafters that run them are
core/head_drafters.py; loading a profile's head is loading/load.py's."""
