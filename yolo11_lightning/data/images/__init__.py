"""Images: reading, the record loader, and the decoded-image caches.

io.py           reading an image (EXIF, retries, reduced-size JPEG decode, the truncation check)
headers.py      the size an image's header claims (seven formats), read before any decode
limits.py       the pixel limit that refuses decompression bombs undecoded, ``ImageReadError``
loading.py      ``RecordImageLoader``: a record's image resized, or a substitute when it cannot be read
cache.py        ``ImageCache`` of decoded, resized images, and the memory budget it checks
node_cache.py   one cache per node in ``/dev/shm``, built by the node's ranks together
shm_segment.py  the shared-memory segments and their stale-segment cleanup
disk_cache.py   the cache as one ``.npy`` file on disk (``cache_images: disk``)
"""
