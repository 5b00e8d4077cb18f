"""The reasoning experience model M_exp: the LLM that plays the environment in the dream.

``protocol`` is the text contract (prompt, target, parser) shared by every backend; ``metrics`` scores
predicted transitions against real ones. Both are pure Python; heavy modules are imported on use.
"""
