"""What several tessera programs share at their edge, outside the pure core: record key
files (loading, rotation, tessera-keys), topology files, and the one log set-up."""
