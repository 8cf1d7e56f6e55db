#include "model/tensor_table.h"

#include "util/error.h"

namespace strata {
namespace {

const char* role_name(TensorRole role) {
  switch (role) {
    case TensorRole::Embedding:
      return "an embedding";
    case TensorRole::Output:
      return "an output head";
    case TensorRole::Matrix:
      return "a matrix";
    case TensorRole::Router:
      return "a router";
    case TensorRole::Expert:
      return "an expert stack";
    case TensorRole::Norm:
      return "a norm";
    case TensorRole::Vector:
      return "a vector";
    case TensorRole::PleTable:
      return "a PLE table";
  }
  return "?";
}

}  // namespace

TensorTable::TensorTable(const GgufFile& file, std::vector<TensorSpec> specs)
    : file_(file), checker_(file), specs_(std::move(specs)) {
  for (size_t i = 0; i < specs_.size(); ++i)
    if (!index_.emplace(specs_[i].name, i).second)
      fail("{}: tensor {} is declared twice in the tensor table (internal error)", file_.path(),
           specs_[i].name);
}

void TensorTable::check() const {
  for (const TensorSpec& spec : specs_)
    if (spec.presence == Presence::Refused && file_.find_tensor(spec.name))
      fail("{}: tensor {}: {}", file_.path(), spec.name, spec.refusal);
  for (const TensorSpec& spec : specs_) {
    if (spec.presence == Presence::Refused) continue;
    const TensorInfo* info = file_.find_tensor(spec.name);
    if (!info) {
      if (spec.presence == Presence::Required)
        fail("{}: missing tensor {}", file_.path(), spec.name);
      continue;
    }
    if (spec.role == TensorRole::PleTable) {
      // The converter pads the n-gram table's rows; the row ids index below the declared count.
      if (info->n_dims != 2 || info->ne[0] != spec.ne[0] || info->ne[1] < spec.ne[1])
        fail(
            "{}: tensor {}: expected shape [{}, at least {}] (rows: ple.head_offsets + "
            "ple.head_vocab_sizes), found {}",
            file_.path(), spec.name, spec.ne[0], spec.ne[1], shape_string(info->ne, info->n_dims));
    } else {
      checker_.check_shape(*info, spec.ne);
    }
    checker_.check_type(*info);
  }
}

const TensorSpec* TensorTable::lookup(const std::string& name) const {
  auto it = index_.find(name + ".weight");
  if (it == index_.end()) it = index_.find(name);
  return it == index_.end() ? nullptr : &specs_[it->second];
}

bool TensorTable::present(const std::string& name) const {
  const TensorSpec* spec = lookup(name);
  return spec && spec->presence != Presence::Refused && file_.find_tensor(spec->name);
}

const TensorSpec& TensorTable::take(const std::string& name,
                                    std::initializer_list<TensorRole> roles, const char* accessor) {
  const TensorSpec* spec = lookup(name);
  if (!spec || spec->presence == Presence::Refused)
    fail("{}: tensor {} is not declared in the tensor table (internal error)", file_.path(), name);
  bool fits = false;
  for (TensorRole role : roles) fits = fits || role == spec->role;
  if (!fits)
    fail("{}: tensor {} is declared as {} but loaded as {} (internal error)", file_.path(),
         spec->name, role_name(spec->role), accessor);
  // check() has run: a Required tensor is there. An Optional one must have been asked about.
  if (!file_.find_tensor(spec->name)) fail("{}: missing tensor {}", file_.path(), spec->name);
  loaded_.push_back(spec->name);
  return *spec;
}

compute::WeightMatrix TensorTable::matrix(const std::string& name) {
  const TensorSpec& spec = take(
      name, {TensorRole::Matrix, TensorRole::Router, TensorRole::Embedding, TensorRole::Output},
      "a matrix");
  return checker_.matrix(spec.name, spec.ne.at(0), spec.ne.at(1));
}

std::vector<float> TensorTable::floats(const std::string& name) {
  const TensorSpec& spec = take(name, {TensorRole::Norm, TensorRole::Vector}, "floats");
  return checker_.floats(spec.name, spec.n_elements());
}

ExpertTensor TensorTable::experts(const std::string& name) {
  const TensorSpec& spec = take(name, {TensorRole::Expert}, "an expert stack");
  return checker_.experts(spec.name, spec.ne.at(0), spec.ne.at(1), spec.ne.at(2));
}

const TensorInfo& TensorTable::table(const std::string& name) {
  const TensorSpec& spec = take(name, {TensorRole::PleTable}, "a PLE table");
  return *file_.find_tensor(spec.name);
}

}  // namespace strata
