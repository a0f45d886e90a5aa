"""The prefix of temporary names: files being written beside their key, and the scratch and
staging directories of an object store's cache. Listings skip them."""

TMP_PREFIX = ".tmp-"
