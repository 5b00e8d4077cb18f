"""The LLM agent (policy): prompt, action parsing, batched acting."""
