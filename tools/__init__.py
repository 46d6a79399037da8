"""The tools a person runs: logjam-send (smoke tests), logjam-tail (watch traffic) and the mesh runner
(make up / down / status / check). They build on the wire library, the bridges' engines and runtime."""
