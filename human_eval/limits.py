"""The limits on a study's images, where `dwb human-eval create`'s flags can read them without loading PIL.

``MAX_SIDE``: the largest side a study's images get by default; a rater's screen shows two side by side. Every
image used to be brought to the largest one's size, and one flat 12000 x 12000 PNG (434 KB) made each image of
the study a 432 MB array: over 4 GiB in 15 s.

``DEFAULT_MAX_MEGAPIXELS``: the most pixels an image may have to be decoded at all, read from its header first.
16 MP (4096 x 4096, a 1024 px image upscaled four times) took 0.24 GB to re-encode, measured: about 15 bytes
a pixel (the decoded pixels, their 8-bit RGB copy and the resized image).
"""
MAX_SIDE = 1024
DEFAULT_MAX_MEGAPIXELS = 16.0
