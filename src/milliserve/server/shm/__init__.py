"""System shared memory (Triton's extension): a region registry shared by the HTTP and gRPC
front ends, which read inputs from regions and write outputs into them around the data
plane. The data plane never knows."""
