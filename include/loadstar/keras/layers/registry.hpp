/// \file
/// `LayerRegistry` (`Registry<Layer>`): Keras `class_name` strings to layer factories, extensible
/// by users.
#pragma once

#include "loadstar/config.hpp"

#include <memory>

#include "loadstar/keras/layer.hpp"
#include "loadstar/keras/layers/activation.hpp"
#include "loadstar/keras/layers/activity_regularization.hpp"
#include "loadstar/keras/layers/add.hpp"
#include "loadstar/keras/layers/additive_attention.hpp"
#include "loadstar/keras/layers/alpha_dropout.hpp"
#include "loadstar/keras/layers/attention.hpp"
#include "loadstar/keras/layers/average.hpp"
#include "loadstar/keras/layers/average_pooling1d.hpp"
#include "loadstar/keras/layers/average_pooling2d.hpp"
#include "loadstar/keras/layers/average_pooling3d.hpp"
#include "loadstar/keras/layers/batch_normalization.hpp"
#include "loadstar/keras/layers/bidirectional.hpp"
#include "loadstar/keras/layers/center_crop.hpp"
#include "loadstar/keras/layers/concatenate.hpp"
#include "loadstar/keras/layers/conv1d.hpp"
#include "loadstar/keras/layers/conv1d_transpose.hpp"
#include "loadstar/keras/layers/conv2d.hpp"
#include "loadstar/keras/layers/conv2d_transpose.hpp"
#include "loadstar/keras/layers/conv3d.hpp"
#include "loadstar/keras/layers/conv3d_transpose.hpp"
#include "loadstar/keras/layers/cropping1d.hpp"
#include "loadstar/keras/layers/cropping2d.hpp"
#include "loadstar/keras/layers/cropping3d.hpp"
#include "loadstar/keras/layers/dense.hpp"
#include "loadstar/keras/layers/depthwise_conv1d.hpp"
#include "loadstar/keras/layers/depthwise_conv2d.hpp"
#include "loadstar/keras/layers/dot.hpp"
#include "loadstar/keras/layers/dropout.hpp"
#include "loadstar/keras/layers/elu.hpp"
#include "loadstar/keras/layers/embedding.hpp"
#include "loadstar/keras/layers/flatten.hpp"
#include "loadstar/keras/layers/gaussian_dropout.hpp"
#include "loadstar/keras/layers/gaussian_noise.hpp"
#include "loadstar/keras/layers/global_pooling1d.hpp"
#include "loadstar/keras/layers/global_pooling2d.hpp"
#include "loadstar/keras/layers/global_pooling3d.hpp"
#include "loadstar/keras/layers/group_normalization.hpp"
#include "loadstar/keras/layers/gru.hpp"
#include "loadstar/keras/layers/input_layer.hpp"
#include "loadstar/keras/layers/layer_normalization.hpp"
#include "loadstar/keras/layers/lstm.hpp"
#include "loadstar/keras/layers/masking.hpp"
#include "loadstar/keras/layers/max_pooling1d.hpp"
#include "loadstar/keras/layers/max_pooling2d.hpp"
#include "loadstar/keras/layers/max_pooling3d.hpp"
#include "loadstar/keras/layers/maximum.hpp"
#include "loadstar/keras/layers/minimum.hpp"
#include "loadstar/keras/layers/multi_head_attention.hpp"
#include "loadstar/keras/layers/multiply.hpp"
#include "loadstar/keras/layers/normalization.hpp"
#include "loadstar/keras/layers/permute.hpp"
#include "loadstar/keras/layers/prelu.hpp"
#include "loadstar/keras/layers/relu.hpp"
#include "loadstar/keras/layers/repeat_vector.hpp"
#include "loadstar/keras/layers/rescaling.hpp"
#include "loadstar/keras/layers/reshape.hpp"
#include "loadstar/keras/layers/resizing.hpp"
#include "loadstar/keras/layers/separable_conv1d.hpp"
#include "loadstar/keras/layers/separable_conv2d.hpp"
#include "loadstar/keras/layers/simple_rnn.hpp"
#include "loadstar/keras/layers/softmax.hpp"
#include "loadstar/keras/layers/spatial_dropout1d.hpp"
#include "loadstar/keras/layers/spatial_dropout2d.hpp"
#include "loadstar/keras/layers/spatial_dropout3d.hpp"
#include "loadstar/keras/layers/stacked_rnn.hpp"
#include "loadstar/keras/layers/subtract.hpp"
#include "loadstar/keras/layers/thresholded_relu.hpp"
#include "loadstar/keras/layers/time_distributed.hpp"
#include "loadstar/keras/layers/unit_normalization.hpp"
#include "loadstar/keras/layers/up_sampling1d.hpp"
#include "loadstar/keras/layers/up_sampling2d.hpp"
#include "loadstar/keras/layers/up_sampling3d.hpp"
#include "loadstar/keras/layers/zero_padding1d.hpp"
#include "loadstar/keras/layers/zero_padding2d.hpp"
#include "loadstar/keras/layers/zero_padding3d.hpp"
#include "loadstar/keras/registry.hpp"

namespace loadstar::keras {

/// The layer registry maps Keras's `class_name` (`"Dense"`) to a factory building the layer from
/// its `get_config()` JSON; every built-in layer is registered, and users add their own.
template <>
struct RegistryTraits<Layer> {
  using Object = std::shared_ptr<Layer>;
  static constexpr const char* kind = "layer class";
  static constexpr bool case_insensitive = false;
  LOADSTAR_DECL static void defaults(Registry<Layer>& registry);
};

}  // namespace loadstar::keras

namespace loadstar::keras::layers {

/// Keras's `class_name` strings to layer factories: `Registry<Layer>`, under the name this
/// library first gave it.
/// \code
/// auto dense = LayerRegistry::instance().create("Dense", {{"units", 10}, {"name", "fc"}});
/// LayerRegistry::instance().add("MyLayer", [](const nlohmann::json& config) {
///   return std::make_shared<MyLayer>(config);
/// });
/// \endcode
using LayerRegistry = Registry<Layer>;

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras {

void RegistryTraits<loadstar::keras::Layer>::defaults(Registry<Layer>& registry) {
  using namespace layers;
  registry.add("InputLayer", InputLayer::from_config);
  registry.add("Dense", Dense::from_config);
  registry.add("Activation", layers::Activation::from_config);
  registry.add("Dropout", Dropout::from_config);
  registry.add("Flatten", Flatten::from_config);
  registry.add("Reshape", Reshape::from_config);
  registry.add("Conv1D", Conv1D::from_config);
  registry.add("Conv2D", Conv2D::from_config);
  registry.add("MaxPooling1D", MaxPooling1D::from_config);
  registry.add("AveragePooling1D", AveragePooling1D::from_config);
  registry.add("GlobalAveragePooling1D", GlobalAveragePooling1D::from_config);
  registry.add("GlobalMaxPooling1D", GlobalMaxPooling1D::from_config);
  registry.add("MaxPooling2D", MaxPooling2D::from_config);
  registry.add("AveragePooling2D", AveragePooling2D::from_config);
  registry.add("GlobalAveragePooling2D", GlobalAveragePooling2D::from_config);
  registry.add("GlobalMaxPooling2D", GlobalMaxPooling2D::from_config);
  registry.add("BatchNormalization", BatchNormalization::from_config);
  registry.add("Concatenate", Concatenate::from_config);
  registry.add("Add", Add::from_config);
  registry.add("Embedding", Embedding::from_config);
  registry.add("ReLU", ReLU::from_config);
  registry.add("LeakyReLU", LeakyReLU::from_config);
  registry.add("Softmax", Softmax::from_config);
  registry.add("LayerNormalization", LayerNormalization::from_config);
  registry.add("ZeroPadding2D", ZeroPadding2D::from_config);
  registry.add("UpSampling2D", UpSampling2D::from_config);
  registry.add("Multiply", Multiply::from_config);
  registry.add("Subtract", Subtract::from_config);
  registry.add("Average", Average::from_config);
  registry.add("Maximum", Maximum::from_config);
  registry.add("Minimum", Minimum::from_config);
  registry.add("Permute", Permute::from_config);
  registry.add("RepeatVector", RepeatVector::from_config);
  registry.add("GaussianNoise", GaussianNoise::from_config);
  registry.add("GaussianDropout", GaussianDropout::from_config);
  registry.add("AlphaDropout", AlphaDropout::from_config);
  registry.add("ActivityRegularization", ActivityRegularization::from_config);
  registry.add("SpatialDropout1D", SpatialDropout1D::from_config);
  registry.add("SpatialDropout2D", SpatialDropout2D::from_config);
  registry.add("SpatialDropout3D", SpatialDropout3D::from_config);
  registry.add("Cropping1D", Cropping1D::from_config);
  registry.add("Cropping2D", Cropping2D::from_config);
  registry.add("Cropping3D", Cropping3D::from_config);
  registry.add("ZeroPadding1D", ZeroPadding1D::from_config);
  registry.add("ZeroPadding3D", ZeroPadding3D::from_config);
  registry.add("UpSampling1D", UpSampling1D::from_config);
  registry.add("UpSampling3D", UpSampling3D::from_config);
  registry.add("PReLU", PReLU::from_config);
  registry.add("ELU", ELU::from_config);
  registry.add("ThresholdedReLU", ThresholdedReLU::from_config);
  registry.add("Rescaling", Rescaling::from_config);
  registry.add("Masking", Masking::from_config);
  registry.add("UnitNormalization", UnitNormalization::from_config);
  registry.add("GroupNormalization", GroupNormalization::from_config);
  registry.add("SimpleRNN", SimpleRNN::from_config);
  registry.add("LSTM", LSTM::from_config);
  registry.add("RNN", layers::detail::any_rnn_from_config);
  registry.add("GRU", GRU::from_config);
  registry.add("Bidirectional", Bidirectional::from_config);
  registry.add("MultiHeadAttention", MultiHeadAttention::from_config);
  registry.add("Attention", Attention::from_config);
  registry.add("AdditiveAttention", AdditiveAttention::from_config);
  registry.add("Dot", Dot::from_config);
  registry.add("DepthwiseConv1D", DepthwiseConv1D::from_config);
  registry.add("DepthwiseConv2D", DepthwiseConv2D::from_config);
  registry.add("SeparableConv1D", SeparableConv1D::from_config);
  registry.add("SeparableConv2D", SeparableConv2D::from_config);
  registry.add("Conv1DTranspose", Conv1DTranspose::from_config);
  registry.add("Conv2DTranspose", Conv2DTranspose::from_config);
  registry.add("GlobalAveragePooling3D", GlobalAveragePooling3D::from_config);
  registry.add("GlobalMaxPooling3D", GlobalMaxPooling3D::from_config);
  registry.add("MaxPooling3D", MaxPooling3D::from_config);
  registry.add("AveragePooling3D", AveragePooling3D::from_config);
  registry.add("Conv3D", Conv3D::from_config);
  registry.add("Conv3DTranspose", Conv3DTranspose::from_config);
  registry.add("Normalization", Normalization::from_config);
  registry.add("Resizing", Resizing::from_config);
  registry.add("CenterCrop", CenterCrop::from_config);
  registry.add("TimeDistributed", [](const nlohmann::json& config) {
    return TimeDistributed::from_config(config, [](const nlohmann::json& layer) {
      return Registry<Layer>::instance().create(layer);
    });
  });
}

}  // namespace loadstar::keras
#endif
