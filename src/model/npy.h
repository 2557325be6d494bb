// Writes a host tensor as a NumPy .npy file (format 1.0, little-endian, C order).
#pragma once

#include <string>

#include "core/tensor.h"

namespace osprey {
void save_npy(const std::string& path, Tensor t);
}
