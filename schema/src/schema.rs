// @generated automatically by Diesel CLI.

diesel::table! {
    accounts (id) {
        #[max_length = 32]
        id -> Varchar,
        balance_cents -> Int8,
        #[max_length = 3]
        currency -> Bpchar,
        opening_balance_cents -> Int8,
        created_at -> Timestamptz,
        #[max_length = 64]
        owner -> Varchar,
        #[max_length = 10]
        kind -> Varchar,
    }
}

diesel::table! {
    antifraud_decisions (transfer_id) {
        transfer_id -> Uuid,
        #[max_length = 32]
        source_account -> Varchar,
        #[max_length = 32]
        destination_account -> Varchar,
        amount_cents -> Int8,
        #[max_length = 3]
        currency -> Bpchar,
        #[max_length = 20]
        outcome -> Varchar,
        score -> Int4,
        reason -> Nullable<Text>,
        requested_at -> Timestamptz,
        decided_at -> Timestamptz,
    }
}

diesel::table! {
    dead_letters (id) {
        id -> Int8,
        #[max_length = 255]
        original_topic -> Varchar,
        original_partition -> Int4,
        original_offset -> Int8,
        original_timestamp -> Nullable<Int8>,
        #[max_length = 255]
        consumer_group -> Varchar,
        #[max_length = 20]
        exception_kind -> Varchar,
        exception_message -> Text,
        attempts -> Int4,
        record_key -> Nullable<Bytea>,
        payload -> Nullable<Bytea>,
        headers -> Jsonb,
        dlt_error -> Text,
        created_at -> Timestamptz,
        replayed_at -> Nullable<Timestamptz>,
    }
}

diesel::table! {
    dlt_replays (id) {
        id -> Int8,
        #[max_length = 255]
        source -> Varchar,
        source_partition -> Nullable<Int4>,
        source_offset -> Int8,
        #[max_length = 255]
        original_topic -> Varchar,
        original_partition -> Int4,
        replayed_offset -> Int8,
        record_key -> Nullable<Bytea>,
        replayed_at -> Timestamptz,
    }
}

diesel::table! {
    heartbeats (stage) {
        #[max_length = 255]
        stage -> Varchar,
        beat_at -> Timestamptz,
    }
}

diesel::table! {
    issuance_audit (transfer_id) {
        transfer_id -> Uuid,
        #[max_length = 64]
        client -> Varchar,
        #[max_length = 16]
        authority -> Varchar,
        recorded_at -> Timestamptz,
    }
}

diesel::table! {
    notification_deliveries (event_id) {
        event_id -> Uuid,
        #[max_length = 255]
        topic -> Varchar,
        transfer_id -> Uuid,
        attempts -> Int4,
        response_status -> Int4,
        delivered_at -> Timestamptz,
    }
}

diesel::table! {
    orders (id) {
        id -> Uuid,
        #[max_length = 128]
        external_reference -> Varchar,
        #[max_length = 64]
        customer_id -> Varchar,
        amount_cents -> Int8,
        #[max_length = 3]
        currency -> Bpchar,
        lines -> Nullable<Jsonb>,
        created_at -> Timestamptz,
        #[max_length = 64]
        client -> Varchar,
    }
}

diesel::table! {
    outbox_events (id) {
        id -> Uuid,
        seq -> Int8,
        #[max_length = 255]
        topic -> Varchar,
        #[max_length = 64]
        key -> Varchar,
        #[max_length = 100]
        event_type -> Varchar,
        payload -> Text,
        #[max_length = 55]
        traceparent -> Nullable<Varchar>,
        shard -> Int4,
        created_at -> Timestamptz,
        published_at -> Nullable<Timestamptz>,
        attempts -> Int4,
        parked_at -> Nullable<Timestamptz>,
        #[max_length = 40]
        park_reason -> Nullable<Varchar>,
        park_error -> Nullable<Text>,
        retry_at -> Nullable<Timestamptz>,
        held -> Bool,
    }
}

diesel::table! {
    postings (id) {
        id -> Int8,
        transfer_id -> Uuid,
        #[max_length = 32]
        account_id -> Varchar,
        #[max_length = 1]
        kind -> Bpchar,
        amount_cents -> Int8,
        created_at -> Timestamptz,
    }
}

diesel::table! {
    processed_transfers (transfer_id) {
        transfer_id -> Uuid,
        #[max_length = 20]
        outcome -> Varchar,
        reason -> Nullable<Text>,
        processed_at -> Timestamptz,
    }
}

diesel::table! {
    received_orders (order_id) {
        order_id -> Uuid,
        event_id -> Uuid,
        #[max_length = 128]
        external_reference -> Varchar,
        #[max_length = 64]
        customer_id -> Varchar,
        amount_cents -> Int8,
        #[max_length = 3]
        currency -> Bpchar,
        received_at -> Timestamptz,
    }
}

diesel::table! {
    transfers (id) {
        id -> Uuid,
        #[max_length = 32]
        source_account -> Varchar,
        #[max_length = 32]
        destination_account -> Varchar,
        amount_cents -> Int8,
        #[max_length = 3]
        currency -> Bpchar,
        #[max_length = 20]
        status -> Varchar,
        rejection_reason -> Nullable<Text>,
        #[max_length = 255]
        idempotency_key -> Nullable<Varchar>,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
        #[max_length = 64]
        client -> Varchar,
        #[max_length = 10]
        kind -> Varchar,
    }
}

diesel::joinable!(issuance_audit -> transfers (transfer_id));
diesel::joinable!(postings -> accounts (account_id));

diesel::allow_tables_to_appear_in_same_query!(
    accounts,
    antifraud_decisions,
    dead_letters,
    dlt_replays,
    heartbeats,
    issuance_audit,
    notification_deliveries,
    orders,
    outbox_events,
    postings,
    processed_transfers,
    received_orders,
    transfers,
);
