"""ScienceWorld as a dreamgym env: ``make("scienceworld", task=...)``; needs ``dreamgym[scienceworld]`` and Java."""
