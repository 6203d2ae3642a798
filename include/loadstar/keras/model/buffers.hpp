/// \file
/// `Model`'s batch buffers: activations, gradients, targets and sample weights allocated by the
/// backend, and batches of any loader kind converted into them, defined out of the class (Taskflow
/// style) so that model.hpp keeps the declaration and each concern has its own file. Included by
/// model.hpp; do not include alone.
#pragma once

#include "loadstar/keras/model.hpp"

namespace loadstar::keras {

LOADSTAR_DECL void Model::reserve(std::size_t rows) {
  if (!weights_placed_) place_weights();
  if (unknown_axes_) {
    // Until a batch settles the shapes, there is nothing to size.
    if (!bound_.empty()) reserve_elements(rows);
    return;
  }
  if (rows <= capacity_) return;
  Backend& backend = this->backend();
  for (auto& node : nodes_) {
    node.value_full = backend.allocate(node.shape.prepend(rows));
    if (node.layer) node.gradient_full = backend.allocate(node.shape.prepend(rows));
    for (std::size_t j = 0; j < node.inputs.size(); ++j) {
      if (node.targets[j] == detail::GradientTarget::accumulate) {
        node.scratch_full[j] = backend.allocate(nodes_[node.inputs[j]].shape.prepend(rows));
      }
    }
  }
  for (std::size_t o = 0; o < output_nodes_.size(); ++o) {
    if (!output_direct_[o]) {
      loss_scratch_full_[o] = backend.allocate(nodes_[output_nodes_[o]].shape.prepend(rows));
    }
    if (targets_full_[o].rank() > 0 &&
        (targets_full_[o].rows() < rows || targets_full_[o].device() != backend.device())) {
      targets_full_[o] = backend.allocate(targets_full_[o].shape().with_rows(rows));
    }
  }
  weights_full_ = backend.allocate({rows});
  masks_.reserve(backend, nodes_, rows);
  staging_full_.clear();
  if (!backend.is_host()) {
    for (std::size_t i = 0; i < input_names_.size(); ++i)
      staging_full_.emplace_back(nodes_[i].shape.prepend(rows));
    staging_weights_full_ = Tensor<float>({rows});
  }
  capacity_ = rows;
  rows_ = 0;
}

LOADSTAR_DECL void Model::reserve_elements(std::size_t rows) {
  Backend& backend = this->backend();
  bool grown = false;
  const auto ensure = [&](Tensor<float>& full, const Shape& sample, bool host) {
    const std::size_t need = std::max<std::size_t>(rows * sample.elements(), 1);
    const Device device = host ? Device() : backend.device();
    if (!full.empty() && full.size() >= need && full.device() == device) return;
    full = host ? Tensor<float>({need}) : backend.allocate({need});
    grown = true;
  };
  for (auto& node : nodes_) {
    ensure(node.value_full, node.shape, false);
    if (node.layer) ensure(node.gradient_full, node.shape, false);
    for (std::size_t j = 0; j < node.inputs.size(); ++j) {
      if (node.targets[j] == detail::GradientTarget::accumulate)
        ensure(node.scratch_full[j], nodes_[node.inputs[j]].shape, false);
    }
  }
  for (std::size_t o = 0; o < output_nodes_.size(); ++o) {
    if (!output_direct_[o]) ensure(loss_scratch_full_[o], nodes_[output_nodes_[o]].shape, false);
  }
  if (masks_.reserve(backend, nodes_, rows)) grown = true;
  if (rows > capacity_) {
    weights_full_ = backend.allocate({rows});
    if (!backend.is_host()) staging_weights_full_ = Tensor<float>({rows});
    grown = true;
  }
  if (!backend.is_host()) {
    staging_full_.resize(input_names_.size());
    for (std::size_t i = 0; i < input_names_.size(); ++i)
      ensure(staging_full_[i], nodes_[i].shape, true);
  }
  capacity_ = std::max(capacity_, rows);
  if (grown) rows_ = 0;
}

LOADSTAR_DECL void Model::bind(const detail::ErasedBatch& batch) {
  std::vector<Shape> shapes(input_names_.size());
  bool same = bound_.size() == shapes.size();
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const auto& member = batch.x[input_order_[i]];
    const Shape& declared = nodes_[i].declared;
    if (member.shape.rank() == 0 || !detail::fits_declared(declared, member.shape.row_shape())) {
      throw ShapeError(
          "model '" + name_ + "': input '" + input_names_[i] + "' expects samples of shape " +
          detail::sample_shape_str(declared) + " but " +
          member_label(batch, true, input_order_[i]) + " has samples of shape " +
          (member.shape.rank() == 0 ? std::string("()") : member.shape.row_shape().str()));
    }
    shapes[i] = member.shape.row_shape();
    same = same && shapes[i] == bound_[i];
  }
  if (same) return;
  bound_.clear();  // until every node is settled: a layer may refuse the lengths
  std::vector<Shape> inputs;
  for (std::size_t k = 0; k < nodes_.size(); ++k) {
    auto& node = nodes_[k];
    if (!node.layer) {
      node.shape = shapes[k];
      continue;
    }
    if (node.primary != detail::RuntimeNode::no_primary) {
      // A later output of a call: its shape for the inputs of its first.
      const auto& first = nodes_[node.primary];
      inputs.clear();
      for (const std::size_t p : first.inputs)
        inputs.push_back(nodes_[p].shape);
      node.shape = node.layer->extra_output_shapes(inputs).at(node.output_index - 1);
      continue;
    }
    inputs.clear();
    for (const std::size_t p : node.inputs)
      inputs.push_back(nodes_[p].shape);
    // A layer built for unknown lengths was built for shapes with `none`, which a batch's never
    // equal: only inputs unchanged since the build keep the declared output.
    node.shape = inputs == node.layer->built_input_shapes() ? node.declared
                                                            : node.layer->output_shape_for(inputs);
    if (!detail::fits_declared(node.declared, node.shape)) {
      throw ShapeError(detail::layer_label(*node.layer) + ": computes samples of shape " +
                       node.shape.str() +
                       " for inputs of this batch, which do not fit its output shape " +
                       detail::sample_shape_str(node.declared));
    }
  }
  bound_ = std::move(shapes);
  std::uint64_t key = 0xCBF29CE484222325ULL;
  for (const Shape& shape : bound_) {
    for (const std::size_t d : shape)
      key = (key ^ d) * 0x100000001B3ULL;
    key = (key ^ 0xFFU) * 0x100000001B3ULL;
  }
  bound_key_ = key << 1U;
  rows_ = 0;
}

LOADSTAR_DECL void Model::place_weights() {
  Backend& backend = this->backend();
  for (const auto& layer : layers_) {
    for (auto& w : layer->weights()) {
      if (w.value.device() != backend.device()) w.value = backend.from_host(w.value);
      if (!w.gradient.empty() && w.gradient.device() != backend.device())
        w.gradient = backend.allocate(w.gradient.shape());
    }
  }
  weights_placed_ = true;
}

template <class Member>
void Model::upload(const Member& member, const detail::ErasedBatch& batch, std::size_t n,
                   const Tensor<float>& staging, const Tensor<float>& target) {
  if (!member.device.is_host()) {
    // Arrays the user keeps in the backend's memory (checked by `check_placement`): the rows are
    // copied there, without crossing the bus.
    const Tensor<float> source = Tensor<float>::wrap(
        static_cast<float*>(const_cast<void*>(member.data)), member.shape, nullptr, member.device);
    backend().copy_rows(source.reshape({member.shape[0], member.shape.row_elements()}), batch.rows,
                        batch.offset, target.reshape({n, member.shape.row_elements()}));
    return;
  }
  if (target.is_host()) {
    detail::convert_rows(member, batch.rows, batch.offset, n, target.data());
    return;
  }
  const Tensor<float> rows =
      staging.reshape({staging.size()}).slice_rows(0, target.size()).reshape(target.shape());
  backend().upload(rows, target, [&](std::span<const Tensor<float>> host) {
    detail::convert_rows(member, batch.rows, batch.offset, n, host[0].data());
  });
}

LOADSTAR_DECL void Model::set_rows(std::size_t rows) {
  if (rows == rows_) return;
  for (auto& node : nodes_) {
    node.value = leading(node.value_full, node.shape, rows);
    if (node.layer) node.gradient = leading(node.gradient_full, node.shape, rows);
  }
  for (auto& node : nodes_) {
    for (std::size_t j = 0; j < node.inputs.size(); ++j) {
      const auto& producer = nodes_[node.inputs[j]];
      node.input_values[j] = producer.value;
      switch (node.targets[j]) {
        case detail::GradientTarget::none:
          node.input_gradients[j] = Tensor<float>();
          break;
        case detail::GradientTarget::direct:
          node.input_gradients[j] = producer.gradient;
          break;
        case detail::GradientTarget::accumulate:
          node.input_gradients[j] = leading(node.scratch_full[j], producer.shape, rows);
          break;
      }
    }
  }
  for (auto& node : nodes_) {
    node.extra_values.resize(node.extras.size());
    node.extra_gradients.resize(node.extras.size());
    for (std::size_t i = 0; i < node.extras.size(); ++i) {
      const auto& extra = nodes_[node.extras[i]];
      node.extra_values[i] = extra.value;
      node.extra_gradients[i] = extra.gradient_written ? extra.gradient : Tensor<float>();
    }
  }
  for (std::size_t o = 0; o < output_nodes_.size(); ++o)
    outputs_[o] = nodes_[output_nodes_[o]].value;
  masks_.set_rows(nodes_, rows);
  weights_ = weights_full_.slice_rows(0, rows);
  rows_ = rows;
}

LOADSTAR_DECL void Model::prepare(const detail::ErasedBatch& batch, std::size_t max_rows) {
  if (!built()) build_from_batch(batch);
  require_built("the model");
  if (unknown_axes_) {
    // The shapes are settled by `load`, which sizes the buffers for them.
    if (!weights_placed_) place_weights();
    return;
  }
  reserve(std::max(max_rows, batch.count));
}

LOADSTAR_DECL std::string Model::member_label(const detail::ErasedBatch& batch, bool is_x,
                                              std::size_t i) const {
  const auto kind = is_x ? batch.x_kind : batch.y_kind;
  const auto& members = is_x ? batch.x : batch.y;
  const std::string name = is_x ? "x" : "y";
  if (kind == detail::MemberKind::tensor) return name;
  if (kind == detail::MemberKind::map) return name + "['" + *members[i].key + "']";
  return name + "[" + std::to_string(i) + "]";
}

LOADSTAR_DECL void Model::check_placement(const detail::MemberView& member,
                                          const std::string& label) const {
  if (member.device.is_host()) return;
  const Device here = backend_->device();
  if (member.device != here) {
    throw DeviceError(
        "model '" + name_ + "': " + label + " is in " + member.device.str() +
        " memory but the model computes in " + here.str() +
        " (keep the arrays on the host, or in the model's backend: backend.from_host(array))");
  }
  if (member.dtype != DType::float32) {
    throw DeviceError("model '" + name_ + "': " + label + " is in " + member.device.str() +
                      " memory with elements of type " + std::string(dtype_name(member.dtype)) +
                      " but arrays in device memory must be float32");
  }
}

LOADSTAR_DECL void Model::match_members(const detail::ErasedBatch& batch, bool is_x,
                                        std::vector<std::size_t>& order) const {
  const auto& members = is_x ? batch.x : batch.y;
  const auto kind = is_x ? batch.x_kind : batch.y_kind;
  const auto& names = is_x ? input_names_ : output_names_;
  const std::string what = is_x ? "input" : "output";
  const std::string name = is_x ? "x" : "y";
  order.resize(names.size());
  if (kind == detail::MemberKind::map) {
    for (const auto& member : members) {
      if (std::find(names.begin(), names.end(), *member.key) == names.end()) {
        throw ConfigError("model '" + name_ + "': " + name + " has the key '" + *member.key +
                          "', which names no " + what + " (" + what + "s: " + joined(names) + ")");
      }
    }
    for (std::size_t i = 0; i < names.size(); ++i) {
      auto found = std::find_if(members.begin(), members.end(),
                                [&](const auto& m) { return *m.key == names[i]; });
      if (found == members.end()) {
        throw ConfigError("model '" + name_ + "': no data for " + what + " '" + names[i] +
                          "' in the map " + name + " (" + what + "s: " + joined(names) + ")");
      }
      order[i] = static_cast<std::size_t>(found - members.begin());
    }
    return;
  }
  if (members.size() != names.size()) {
    throw ShapeError("model '" + name_ + "': has " + std::to_string(names.size()) + " " + what +
                     (names.size() == 1 ? "" : "s") + " but " + name + " has " +
                     std::to_string(members.size()) + " array" + (members.size() == 1 ? "" : "s"));
  }
  for (std::size_t i = 0; i < names.size(); ++i)
    order[i] = i;
}

LOADSTAR_DECL void Model::load(const detail::ErasedBatch& batch, bool targets,
                               const ClassWeight* class_weight) {
  const std::size_t n = batch.count;
  if (n == 0) throw ShapeError("model '" + name_ + "': a batch has no rows");
  if (!text_inputs_.empty() && !feeding_text_) refuse_arrays_for_text();
  match_members(batch, true, input_order_);
  if (unknown_axes_) bind(batch);
  reserve(n);
  set_rows(n);
  for (std::size_t i = 0; i < input_order_.size(); ++i) {
    const auto& member = batch.x[input_order_[i]];
    const auto& node = nodes_[i];
    if (member.shape.rank() == 0 || member.shape.row_shape() != node.shape) {
      throw ShapeError(
          "model '" + name_ + "': input '" + input_names_[i] + "' expects samples of shape " +
          node.shape.str() + " but " + member_label(batch, true, input_order_[i]) +
          " has samples of shape " +
          (member.shape.rank() == 0 ? std::string("()") : member.shape.row_shape().str()));
    }
    if (batch.rows.empty() && member.shape[0] < batch.offset + n) {
      throw ShapeError("model '" + name_ + "': " + member_label(batch, true, input_order_[i]) +
                       " has " + std::to_string(member.shape[0]) + " rows but the batch has " +
                       std::to_string(n));
    }
    check_placement(member, member_label(batch, true, input_order_[i]));
    upload(member, batch, n, staging_full_.empty() ? Tensor<float>() : staging_full_[i],
           node.value);
  }
  has_weights_ = false;
  if (!targets) return;
  if (batch.y_kind == detail::MemberKind::none) {
    throw ShapeError("model '" + name_ + "': the batch has no targets y");
  }
  match_members(batch, false, target_order_);
  if (staging_targets_.size() != target_order_.size())
    staging_targets_.resize(target_order_.size());
  for (std::size_t o = 0; o < target_order_.size(); ++o) {
    const auto& member = batch.y[target_order_[o]];
    if (member.shape.rank() == 0) {
      throw ShapeError("model '" + name_ + "': " + member_label(batch, false, target_order_[o]) +
                       " is a scalar but targets need a batch axis");
    }
    if (batch.rows.empty() && member.shape[0] < batch.offset + n) {
      throw ShapeError("model '" + name_ + "': " + member_label(batch, false, target_order_[o]) +
                       " has " + std::to_string(member.shape[0]) + " rows but x has " +
                       std::to_string(n));
    }
    check_placement(member, member_label(batch, false, target_order_[o]));
    const Shape wanted = member.shape.with_rows(capacity_);
    if (unknown_axes_) {
      // Targets of varying length (a sequence's): a buffer of the most elements so far.
      const std::size_t need = std::max<std::size_t>(wanted.elements(), 1);
      if (targets_full_[o].size() < need || targets_full_[o].device() != backend().device())
        targets_full_[o] = backend().allocate({need});
      targets_[o] = leading(targets_full_[o], member.shape.row_shape(), n);
      if (!targets_[o].is_host() && staging_targets_[o].size() < need)
        staging_targets_[o] = Tensor<float>({need});
      upload(member, batch, n, staging_targets_[o], targets_[o]);
      continue;
    }
    if (targets_full_[o].shape() != wanted || targets_full_[o].device() != backend().device())
      targets_full_[o] = backend().allocate(wanted);
    targets_[o] = targets_full_[o].slice_rows(0, n);
    if (!targets_[o].is_host() && staging_targets_[o].shape() != wanted)
      staging_targets_[o] = Tensor<float>(wanted);
    upload(member, batch, n, staging_targets_[o], targets_[o]);
  }
  if (batch.w) {
    if (batch.w->shape.rank() != 1 || batch.w->dtype != DType::float32) {
      throw ShapeError("model '" + name_ + "': sample_weight must be a rank-1 float32 tensor but " +
                       "has shape " + batch.w->shape.str());
    }
    check_placement(*batch.w, "sample_weight");
    upload(*batch.w, batch, n, staging_weights_full_, weights_);
    has_weights_ = true;
  } else if (class_weight) {
    apply_class_weight(n, *class_weight);
    has_weights_ = true;
  }
}

LOADSTAR_DECL void Model::apply_class_weight(std::size_t n, const ClassWeight& class_weight) {
  if (targets_.size() != 1) {
    throw ConfigError(
        "fit: class_weight is supported for a single output only but the model "
        "has " +
        std::to_string(targets_.size()));
  }
  // Reads the targets and writes the weights on the host, as the backend's host kernel.
  backend().on_host({targets_.front(), weights_}, [&](std::span<const Tensor<float>> t) {
    const auto& y = t[0];
    const std::size_t width = y.row_size();
    for (std::size_t i = 0; i < n; ++i) {
      const float* row = y.data() + i * width;
      std::int64_t label = 0;
      if (width == 1) {
        label = static_cast<std::int64_t>(std::llround(row[0]));
      } else {
        label = static_cast<std::int64_t>(std::max_element(row, row + width) - row);
      }
      auto found = class_weight.find(label);
      if (found == class_weight.end()) {
        throw ConfigError("class_weight: no weight for class " + std::to_string(label));
      }
      t[1].data()[i] = found->second;
    }
  });
}

}  // namespace loadstar::keras
