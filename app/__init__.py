"""app: a Gradio app that generates images from any checkpoint (`dwb app`).

- ``checkpoints``: the allowed folders, discovery under them, checking a named path, checkpoint hashes;
- ``generate``: parameters, validation, samplers, per-image seeds, PNG parameters (no Gradio);
- ``cache``: the least-recently-used cache of loaded pipelines;
- ``service``: roots + device + cache + stop requests + each client's running work, what the UI and the API call;
- ``uploads``: what Gradio's upload route may keep, per client and in all, and their deletion;
- ``ui``: the Gradio Blocks (Generate and Compare tabs, the API); ``cli``: `dwb app`.
"""
