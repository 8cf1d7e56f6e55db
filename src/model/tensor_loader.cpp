#include "model/tensor_loader.h"

#include "quant/quant.h"
#include "util/error.h"

namespace strata {

std::string shape_string(const int64_t* ne, int n_dims) {
  std::string out = "[";
  for (int i = 0; i < n_dims; ++i) out += (i ? ", " : "") + std::to_string(ne[i]);
  return out + "]";
}

void TensorLoader::check_type(const TensorInfo& info) const {
  if (!type_traits(info.type).has_kernels)
    fail(
        "{}: tensor {}: type {} is not supported for compute (supported: f32, f16, bf16, q8_0, "
        "q4_0, q4_K, q6_K, q2_K, iq2_xs, iq2_xxs, iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m)",
        file_.path(), info.name, type_name(info.type));
}

void TensorLoader::check_shape(const TensorInfo& info, const std::vector<int64_t>& shape) const {
  bool same = true;
  for (int i = 0; same && i < 4; ++i) {
    const int64_t want = i < int(shape.size()) ? shape[i] : 1;
    if (info.ne[i] != want) same = false;
  }
  if (!same)
    fail("{}: tensor {}: expected shape {}, found {}", file_.path(), info.name,
         shape_string(shape.data(), int(shape.size())), shape_string(info.ne, info.n_dims));
}

compute::WeightMatrix ExpertTensor::expert(int64_t e) const {
  return compute::WeightMatrix{type, n_in, n_out, mapped + size_t(e) * expert_bytes, row_bytes(type, n_in)};
}

const TensorInfo* TensorLoader::find(const std::string& name) const {
  if (const TensorInfo* info = file_.find_tensor(name + ".weight")) return info;
  return file_.find_tensor(name);
}

const TensorInfo& TensorLoader::checked(const std::string& name,
                                         const std::vector<int64_t>& shape) const {
  const TensorInfo* info = find(name);
  if (!info) fail("{}: missing tensor {}", file_.path(), name);
  check_shape(*info, shape);
  check_type(*info);
  return *info;
}

compute::WeightMatrix TensorLoader::matrix(const std::string& name, int64_t n_in, int64_t n_out) const {
  const TensorInfo& info = checked(name, {n_in, n_out});
  return compute::WeightMatrix{info.type, n_in, n_out, file_.tensor_data(info), info.row_bytes()};
}

std::vector<float> TensorLoader::floats(const std::string& name, int64_t n) const {
  const TensorInfo* info = find(name);
  if (!info) fail("{}: missing tensor {}", file_.path(), name);
  if (info->n_elements() != n)
    fail("{}: tensor {}: expected {} elements, found {} (shape {})", file_.path(), name, n,
         info->n_elements(), shape_string(info->ne, info->n_dims));
  check_type(*info);
  std::vector<float> out(static_cast<size_t>(n));
  const int64_t row = info->ne[0];
  const uint8_t* data = file_.tensor_data(*info);
  for (int64_t r = 0; r < n / row; ++r)
    quant::dequantize_row(info->type, data + size_t(r) * info->row_bytes(), out.data() + r * row, row);
  return out;
}

ExpertTensor TensorLoader::experts(const std::string& name, int64_t n_in, int64_t n_out,
                                   int64_t n_expert) const {
  const TensorInfo& info = checked(name, {n_in, n_out, n_expert});
  ExpertTensor out;
  out.type = info.type;
  out.n_in = n_in;
  out.n_out = n_out;
  out.n_expert = n_expert;
  out.file_offset = info.file_offset;
  out.expert_bytes = info.row_bytes() * size_t(n_out);
  out.mapped = file_.tensor_data(info);
  return out;
}

}  // namespace strata
