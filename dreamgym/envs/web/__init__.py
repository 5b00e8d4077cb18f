"""The WebArena path: the shop served as a real website (``site``), a ``browser`` env driving Chromium through
Playwright with BrowserGym-style observations and actions (``env``, ``axtree``), the shop oracle as browser
actions (``policies``) and WebArena's evaluators for a user's own deployment (``webarena``).

Nothing here is imported by ``import dreamgym``; the env is registered lazily (``dreamgym.envs``).
"""
