"""Training routines shared by the experience model and the policy (SFT)."""
