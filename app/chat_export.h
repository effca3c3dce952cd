// A chat written out for reading or for other programs: Markdown (a heading
// per message, the text as it is) and JSON (the title, times and settings,
// and every message with its role, state and generation notes). Works from
// the store alone: no model needs to be loaded.
#pragma once

#include <QByteArray>
#include <QString>
#include <vector>

#include "storage/store.h"

/// The chat as Markdown.
QString chatToMarkdown(const loom::storage::ChatRow& chat,
                       const std::vector<loom::storage::MessageRow>& messages);
/// The chat as an indented JSON document ({"format": "loom-chat", "version": 1, ...}).
QByteArray chatToJson(const loom::storage::ChatRow& chat,
                      const std::vector<loom::storage::MessageRow>& messages);

/// Writes chat `chatId` from `store` to `path`: JSON when the name ends in
/// ".json", Markdown otherwise. False with a message for the user.
bool exportChat(loom::storage::Store* store, qint64 chatId, const QString& path, QString* error);
