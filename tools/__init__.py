"""The tools a person runs: logjam-send (smoke tests), logjam-tail (watch traffic), logjam-sql (query
the table), logjam-keys (the mesh's CURVE keys) and the mesh runner (make up / down / status / check).
They build on the wire library, the bridges' engines, runtime, and (logjam-sql) the table and warehouse."""
