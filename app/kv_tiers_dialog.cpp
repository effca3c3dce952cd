#include "app/kv_tiers_dialog.h"

#include <QComboBox>
#include <QDialogButtonBox>
#include <QDir>
#include <QDoubleSpinBox>
#include <QFileDialog>
#include <QFileInfo>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QLocale>
#include <QPushButton>
#include <QSettings>
#include <QVBoxLayout>
#include <algorithm>

namespace {
enum RamMode { kAuto = 0, kNoLimit = 1, kLimit = 2 };
enum GpuMode { kGpuAll = 0, kGpuLimit = 1 };
}  // namespace

KvTiersDialog::KvTiersDialog(const KvTierSettings& current, const QString& defaultDir,
                             QWidget* parent)
    : QDialog(parent), m_defaultDir(defaultDir) {
  setWindowTitle(tr("KV cache memory"));
  setObjectName(QStringLiteral("KvTiersDialog"));
  auto* v = new QVBoxLayout(this);
  auto* intro = new QLabel(
      tr("A long context keeps its KV cache in host RAM up to a budget. Older blocks then "
         "move to a spill file on the SSD and are read back while the model attends to them; "
         "the first and the newest tokens always stay. Nothing is lost: a block that cannot "
         "be read back is computed again. The loaded model's session is made again when you "
         "press OK (the chat's context is read again at the next reply)."),
      this);
  intro->setWordWrap(true);
  intro->setObjectName(QStringLiteral("Muted"));
  v->addWidget(intro);

  auto* form = new QFormLayout;
  auto* gpu = new QHBoxLayout;
  m_gpuMode = new QComboBox(this);
  m_gpuMode->setObjectName(QStringLiteral("KvGpuMode"));
  m_gpuMode->addItem(tr("As much as fits beside the weights (all, when the context fits)"));
  m_gpuMode->addItem(tr("Up to"));
  m_gpuMode->setToolTip(
      tr("With a limit, the first and the newest tokens and the blocks the model attends to "
         "most stay on the GPU; the others move to host RAM, where the CPU attends to them."));
  m_gpuGiB = new QDoubleSpinBox(this);
  m_gpuGiB->setObjectName(QStringLiteral("KvGpuGiB"));
  m_gpuGiB->setRange(0.0625, 4096);
  m_gpuGiB->setDecimals(2);
  m_gpuGiB->setSingleStep(0.5);
  m_gpuGiB->setSuffix(tr(" GiB"));
  m_gpuGiB->setValue(2);
  gpu->addWidget(m_gpuMode, 1);
  gpu->addWidget(m_gpuGiB);
  form->addRow(tr("GPU"), gpu);

  auto* ram = new QHBoxLayout;
  m_ramMode = new QComboBox(this);
  m_ramMode->setObjectName(QStringLiteral("KvRamMode"));
  m_ramMode->addItem(tr("Automatic: half the free memory, when the context needs more"));
  m_ramMode->addItem(tr("No limit: never spill to the SSD"));
  m_ramMode->addItem(tr("Up to"));
  m_ramGiB = new QDoubleSpinBox(this);
  m_ramGiB->setObjectName(QStringLiteral("KvRamGiB"));
  m_ramGiB->setRange(0.0625, 4096);
  m_ramGiB->setDecimals(2);
  m_ramGiB->setSingleStep(0.5);
  m_ramGiB->setSuffix(tr(" GiB"));
  m_ramGiB->setValue(4);
  ram->addWidget(m_ramMode, 1);
  ram->addWidget(m_ramGiB);
  form->addRow(tr("Host RAM"), ram);

  auto* dir = new QHBoxLayout;
  m_dir = new QLineEdit(this);
  m_dir->setObjectName(QStringLiteral("KvSpillDir"));
  m_dir->setPlaceholderText(defaultDir);
  m_dir->setClearButtonEnabled(true);
  m_browse = new QPushButton(tr("Browse…"), this);
  dir->addWidget(m_dir, 1);
  dir->addWidget(m_browse);
  form->addRow(tr("Spill folder (SSD)"), dir);

  m_policy = new QComboBox(this);
  m_policy->setObjectName(QStringLiteral("KvPolicy"));
  m_policy->addItem(tr("Least attended blocks first (importance)"), QStringLiteral("importance"));
  m_policy->addItem(tr("Least recently used blocks first (LRU)"), QStringLiteral("lru"));
  form->addRow(tr("Spill first"), m_policy);

  m_spillType = new QComboBox(this);
  m_spillType->setObjectName(QStringLiteral("KvSpillType"));
  m_spillType->addItem(tr("As in RAM (the cache's precision)"), QString());
  m_spillType->addItem(tr("Q8_0: half the bytes of an F16 cache to read back"),
                       QStringLiteral("q8_0"));
  m_spillType->addItem(tr("FP8 (E4M3, a scale per block): about half the bytes of F16"),
                       QStringLiteral("fp8"));
  form->addRow(tr("Precision on the SSD"), m_spillType);
  v->addLayout(form);

  m_error = new QLabel(this);
  m_error->setObjectName(QStringLiteral("Error"));
  m_error->setWordWrap(true);
  m_error->hide();
  v->addWidget(m_error);

  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel, this);
  connect(buttons, &QDialogButtonBox::accepted, this, &KvTiersDialog::accept);
  connect(buttons, &QDialogButtonBox::rejected, this, &KvTiersDialog::reject);
  v->addWidget(buttons);

  connect(m_ramMode, &QComboBox::currentIndexChanged, this, [this] { updateEnabled(); });
  connect(m_gpuMode, &QComboBox::currentIndexChanged, this, [this] { updateEnabled(); });
  connect(m_browse, &QPushButton::clicked, this, [this] {
    const QString start = m_dir->text().isEmpty() ? m_defaultDir : m_dir->text();
    const QString d = QFileDialog::getExistingDirectory(this, tr("Spill folder"), start);
    if (!d.isEmpty()) m_dir->setText(d);
  });
  setSettings(current);
  setMinimumWidth(560);
}

void KvTiersDialog::setSettings(const KvTierSettings& s) {
  m_gpuMode->setCurrentIndex(s.gpuBudgetMiB > 0 ? kGpuLimit : kGpuAll);
  if (s.gpuBudgetMiB > 0) m_gpuGiB->setValue(static_cast<double>(s.gpuBudgetMiB) / 1024.0);
  if (s.ramBudgetMiB < 0) {
    m_ramMode->setCurrentIndex(kAuto);
  } else if (s.ramBudgetMiB == 0) {
    m_ramMode->setCurrentIndex(kNoLimit);
  } else {
    m_ramMode->setCurrentIndex(kLimit);
    m_ramGiB->setValue(static_cast<double>(s.ramBudgetMiB) / 1024.0);
  }
  m_dir->setText(s.spillDir);
  m_policy->setCurrentIndex(std::max(0, m_policy->findData(s.policy)));
  m_spillType->setCurrentIndex(std::max(0, m_spillType->findData(s.spillType)));
  updateEnabled();
}

KvTierSettings KvTiersDialog::settings() const {
  KvTierSettings s;
  s.gpuBudgetMiB = m_gpuMode->currentIndex() == kGpuLimit
                       ? std::max<qint64>(1, qRound64(m_gpuGiB->value() * 1024.0))
                       : 0;
  switch (m_ramMode->currentIndex()) {
    case kNoLimit: s.ramBudgetMiB = 0; break;
    case kLimit: s.ramBudgetMiB = std::max<qint64>(1, qRound64(m_ramGiB->value() * 1024.0)); break;
    default: s.ramBudgetMiB = -1;
  }
  s.spillDir = m_dir->text().trimmed();
  s.policy = m_policy->currentData().toString();
  s.spillType = m_spillType->currentData().toString();
  return s;
}

void KvTiersDialog::updateEnabled() {
  const bool limit = m_ramMode->currentIndex() == kLimit;
  const bool spills = m_ramMode->currentIndex() != kNoLimit;
  m_ramGiB->setEnabled(limit);
  m_gpuGiB->setEnabled(m_gpuMode->currentIndex() == kGpuLimit);
  m_dir->setEnabled(spills);
  m_browse->setEnabled(spills);
  m_policy->setEnabled(spills);
  m_spillType->setEnabled(spills);
}

void KvTiersDialog::accept() {
  const KvTierSettings s = settings();
  if (s.ramBudgetMiB != 0 && !s.spillDir.isEmpty()) {
    // The engine writes its spill file there: the folder must exist (or be
    // made) and be writable, else say so here rather than at the next reply.
    const QFileInfo fi(s.spillDir);
    if (!QDir().mkpath(s.spillDir) || !QFileInfo(s.spillDir).isDir() ||
        !QFileInfo(s.spillDir).isWritable()) {
      m_error->setText(tr("The spill folder %1 cannot be written: choose another one.")
                           .arg(QDir::toNativeSeparators(fi.absoluteFilePath())));
      m_error->show();
      return;
    }
  }
  QDialog::accept();
}

KvTierSettings KvTiersDialog::load(const QString& path) {
  QSettings ini(path, QSettings::IniFormat);
  KvTierSettings s;
  s.gpuBudgetMiB =
      std::max<qint64>(0, ini.value(QStringLiteral("kv/gpuBudgetMiB"), 0).toLongLong());
  s.ramBudgetMiB = ini.value(QStringLiteral("kv/ramBudgetMiB"), -1).toLongLong();
  s.spillDir = ini.value(QStringLiteral("kv/spillDir")).toString();
  const QString policy = ini.value(QStringLiteral("kv/policy"), s.policy).toString();
  if (policy == QLatin1String("lru") || policy == QLatin1String("importance")) s.policy = policy;
  const QString type = ini.value(QStringLiteral("kv/spillType")).toString();
  if (type.isEmpty() || type == QLatin1String("q8_0") || type == QLatin1String("fp8"))
    s.spillType = type;
  return s;
}

void KvTiersDialog::save(const QString& path, const KvTierSettings& s) {
  QSettings ini(path, QSettings::IniFormat);
  ini.setValue(QStringLiteral("kv/gpuBudgetMiB"), s.gpuBudgetMiB);
  ini.setValue(QStringLiteral("kv/ramBudgetMiB"), s.ramBudgetMiB);
  ini.setValue(QStringLiteral("kv/spillDir"), s.spillDir);
  ini.setValue(QStringLiteral("kv/policy"), s.policy);
  ini.setValue(QStringLiteral("kv/spillType"), s.spillType);
}

QString KvTiersDialog::summary(const KvTierSettings& s, const QString& defaultDir) {
  const QString gpu = s.gpuBudgetMiB > 0
                          ? tr("KV on the GPU up to %1; ")
                                .arg(QLocale::system().formattedDataSize(
                                    s.gpuBudgetMiB << 20, 1, QLocale::DataSizeTraditionalFormat))
                          : QString();
  if (s.ramBudgetMiB == 0) return gpu + tr("KV beyond the GPU: host RAM, no limit (no SSD spill)");
  const QString ram = s.ramBudgetMiB < 0
                          ? tr("automatic")
                          : QLocale::system().formattedDataSize(s.ramBudgetMiB << 20, 1,
                                                                QLocale::DataSizeTraditionalFormat);
  return gpu +
         tr("KV beyond the GPU: RAM %1, then SSD in %2")
             .arg(ram, QDir::toNativeSeparators(s.spillDir.isEmpty() ? defaultDir : s.spillDir));
}
