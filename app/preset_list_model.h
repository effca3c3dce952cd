// Placement presets: named placements in the store (the engine's JSON, see
// PlacementPlanner::toPresetJson), listed for the preset selector. A preset
// remembers the layer count of the model it was saved for; presets of another
// shape are listed, disabled, saying so.
#pragma once

#include <QAbstractListModel>
#include <QString>
#include <vector>

#include "storage/store.h"

class PresetListModel : public QAbstractListModel {
  Q_OBJECT
 public:
  enum Role { PresetIdRole = Qt::UserRole + 1, SpecRole, CompatibleRole };

  /// `store` is the GUI thread's connection; it must outlive the model.
  explicit PresetListModel(loom::storage::Store* store, QObject* parent = nullptr);

  /// Reads the presets again.
  void reload();
  /// The loaded model's layer count (0: none): presets of another shape are disabled.
  void setLayerCount(int nLayer);

  /// Saves (or replaces, by name) a preset; returns its id, or 0 with `error` set.
  qint64 save(const QString& name, const QString& spec, int nLayer, const QString& model,
              QString* error);
  bool remove(qint64 presetId, QString* error);

  /// The preset with this id, or null.
  const loom::storage::PlacementPreset* preset(qint64 presetId) const;
  int rowOf(qint64 presetId) const;  ///< -1 when absent
  bool compatible(const loom::storage::PlacementPreset& p) const;

  int rowCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role) const override;
  Qt::ItemFlags flags(const QModelIndex& index) const override;

 signals:
  void errorOccurred(const QString& message);

 private:
  loom::storage::Store* m_store;
  int m_nLayer = 0;
  std::vector<loom::storage::PlacementPreset> m_presets;
};
