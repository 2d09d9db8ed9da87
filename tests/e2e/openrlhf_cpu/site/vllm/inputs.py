TokensPrompt = dict  # vLLM's is a TypedDict: a dict with ``prompt_token_ids``
