"""`python -m relconv.demo`: the op on random data, MinkUNet on a real LiDAR scan, R-GCN on a real KG."""
