"""What the operator knows of the cluster: caches fed by watches, and pure facts read from them."""
