"""Quality: lm-eval scores, a logprob canary, top-k KL against fp16, and fixed-prompt samples.

Every variant is scored by the same evaluator (lm-eval's ``local-completions``)
through an OpenAI-compatible server, so quality and speed come from one route.
"""
