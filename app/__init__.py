"""app: a Gradio app that generates images from any checkpoint."""
