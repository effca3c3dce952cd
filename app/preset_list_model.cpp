#include "app/preset_list_model.h"

PresetListModel::PresetListModel(loom::storage::Store* store, QObject* parent)
    : QAbstractListModel(parent), m_store(store) {
  reload();
}

void PresetListModel::reload() {
  beginResetModel();
  m_presets.clear();
  if (m_store) {
    auto list = m_store->list_presets();
    if (list.ok())
      m_presets = std::move(list).value();
    else
      emit errorOccurred(QString::fromStdString(list.message()));
  }
  endResetModel();
}

void PresetListModel::setLayerCount(int nLayer) {
  if (nLayer == m_nLayer) return;
  m_nLayer = nLayer;
  if (!m_presets.empty()) emit dataChanged(index(0), index(rowCount() - 1));
}

qint64 PresetListModel::save(const QString& name, const QString& spec, int nLayer,
                             const QString& model, QString* error) {
  const QString n = name.simplified();
  if (n.isEmpty()) {
    *error = tr("A preset needs a name.");
    return 0;
  }
  if (!m_store) {
    *error = tr("Presets cannot be saved: the store is not open.");
    return 0;
  }
  auto id = m_store->save_preset(n.toStdString(), spec.toStdString(), nLayer, model.toStdString());
  if (!id.ok()) {
    *error = QString::fromStdString(id.message());
    return 0;
  }
  reload();
  return *id;
}

bool PresetListModel::remove(qint64 presetId, QString* error) {
  if (!m_store) return false;
  loom::Status st = m_store->delete_preset(presetId);
  if (!st.ok()) {
    *error = QString::fromStdString(st.message());
    return false;
  }
  reload();
  return true;
}

const loom::storage::PlacementPreset* PresetListModel::preset(qint64 presetId) const {
  for (const auto& p : m_presets) {
    if (p.id == presetId) return &p;
  }
  return nullptr;
}

int PresetListModel::rowOf(qint64 presetId) const {
  for (size_t i = 0; i < m_presets.size(); ++i) {
    if (m_presets[i].id == presetId) return static_cast<int>(i);
  }
  return -1;
}

bool PresetListModel::compatible(const loom::storage::PlacementPreset& p) const {
  return m_nLayer > 0 && (p.n_layer == 0 || p.n_layer == m_nLayer);
}

int PresetListModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(m_presets.size());
}

QVariant PresetListModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() >= rowCount()) return {};
  const auto& p = m_presets[static_cast<size_t>(index.row())];
  switch (role) {
    case Qt::DisplayRole: {
      const QString name = QString::fromStdString(p.name);
      return compatible(p) || p.n_layer == 0 ? name : tr("%1 (%2 layers)").arg(name).arg(p.n_layer);
    }
    case Qt::ToolTipRole: {
      QString tip = p.model.empty() ? tr("Saved placement")
                                    : tr("Saved for %1").arg(QString::fromStdString(p.model));
      if (p.n_layer > 0) tip += tr(" · %1 layers").arg(p.n_layer);
      if (!compatible(p)) {
        tip += m_nLayer > 0 ? tr("\nThe model loaded now has %1 layers.").arg(m_nLayer)
                            : tr("\nLoad a model first.");
      }
      return tip;
    }
    case PresetIdRole: return static_cast<qint64>(p.id);
    case SpecRole: return QString::fromStdString(p.spec);
    case CompatibleRole: return compatible(p);
    default: return {};
  }
}

Qt::ItemFlags PresetListModel::flags(const QModelIndex& index) const {
  if (!index.isValid() || index.row() >= rowCount()) return Qt::NoItemFlags;
  return compatible(m_presets[static_cast<size_t>(index.row())])
             ? Qt::ItemIsEnabled | Qt::ItemIsSelectable
             : Qt::NoItemFlags;
}
