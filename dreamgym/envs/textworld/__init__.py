"""TextWorld games (tw-cooking by default) as a dreamgym env: ``make("textworld")``; needs ``dreamgym[textworld]``."""
